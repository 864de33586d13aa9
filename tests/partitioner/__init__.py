"""Unit tests of the partitioner package, one file per module."""
