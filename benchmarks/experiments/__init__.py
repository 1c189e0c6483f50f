"""Finished experiments: memory on partially observed tasks, the VLA experiments, PushCubeRL's variants."""
