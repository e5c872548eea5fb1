"""Data for the workloads: loaders of the real data sets, synthetic stand-ins, local tokenizers, batching.

Deterministic for a seed; expensive work is cached under the workload's cache folder (harness.data.cache).
"""
