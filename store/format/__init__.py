"""The store's format: variable names and dims (schema), derivation on read, stored precision
(packing), chunking, the shard file, the manifest, a job's parts and the faithfulness file's
layout. It imports no other room of store/ (io/ reads and writes it, README.txt included)."""
