"""Helpers of the test suite: real processes, real HTTP, test images."""
