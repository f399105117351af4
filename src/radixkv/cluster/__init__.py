"""Several RadixKV replicas behind an existing router (smg, vllm-router) on one machine:
`radixkv.cluster.launch.start_cluster` for tests and benchmarks, `radixkv cluster up` for
trying it out. RadixKV writes no router of its own."""
