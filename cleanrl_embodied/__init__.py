"""cleanrl_embodied: single-file RL trainers for embodied tasks."""
