"""Model folders and files on disk, checked before anything heavy is imported (no torch): which
models are here and which loads by default, GGUF imports, downloads from the Hugging Face Hub."""
