"""The bad-input suite: each class's table lives in its own test module, run by harness.py."""
