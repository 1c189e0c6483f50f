"""Commit archaeology: which commits changed what a run computes, and how the code of other commits learned."""
