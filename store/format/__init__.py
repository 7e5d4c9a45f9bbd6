"""The store's format: vocabulary, variable names, formulas, stored precision, chunking,
the shard file, the manifest, and the README.txt that describes a store."""
