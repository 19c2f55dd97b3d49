"""Model folders and files on disk, checked before anything heavy is imported (no torch)."""
