"""Getting a model onto this machine: Hugging Face search, listing and download, and GGUF import."""
