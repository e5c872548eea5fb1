"""Data for the workloads: loaders of the real data sets (GLUE MNLI, Criteo Kaggle, CodeSearchNet-style
code), synthetic stand-ins that need no download, tokenizers trained locally, and batching.

Everything here is deterministic for a seed and caches expensive work (tokenizers, tokenized corpora,
generated files) under a cache directory given by the workload params (default: the run's cache folder,
``<results_dir>/cache``, see harness.data.cache.CACHE_ENV).
"""
