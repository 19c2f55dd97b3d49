"""What a model and its numbers are, with no torch: shapes, families, weight formats, KV dtypes,
sampling defaults."""
