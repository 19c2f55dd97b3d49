"""Loading a model folder onto a device in a weight format."""
