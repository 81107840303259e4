"""Run infrastructure: the choices a config leaves open (`resolve`), checkpoints and resuming, devices and
torch.distributed, metrics and TensorBoard logging."""
