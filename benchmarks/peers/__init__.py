"""Side by side with other projects (CleanRL, rsl_rl, mjlab, sb3-contrib), and the runners of their side."""
