"""The grouped expert product of a mixture of experts: routing, the plan that groups a batch's
tokens by expert, the PyTorch reference and the Triton kernel that must equal it."""
