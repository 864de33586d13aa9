"""partitioner"""
