"""Running a package: read it back (package_reader), check it can run on a provider
(runnable), create onnxruntime sessions (ort_session), step its decoder with its cache
(cached_session, decoder_session), decode greedily (greedy), decode speculatively with its
MTP head (mtp_head, speculative, draft_control), chain an Omni package's graphs
(omni_session). Requires the `runtime` extra for everything that creates a session."""
