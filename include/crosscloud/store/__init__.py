"""Object stores and what crosses them: S3, credentials, digests, the commit protocol, chunked artifacts, safetensors, emulated links."""
