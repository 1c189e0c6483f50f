"""User code built on the trainers' public hooks (``--policy examples.<module>:<factory>``), not part of the package."""
