"""Tensor parallelism across GPUs of one host (CPU processes over gloo for tests): rank 0's batch
passes broadcast to the followers (batch_ops.py), each rank running the same batched decoder over
its shard of the weights (sharded_step.py), and their all-reduce."""
