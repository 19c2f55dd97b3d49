"""Which models there are, where they come from, and whether they fit this machine."""
