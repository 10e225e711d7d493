"""Running a package: read it back (package_reader), step its decoder (runtime), decode
speculatively with its MTP head (mtp_head, speculative, draft_control), chain an Omni
package's graphs (omni_session). Requires the `runtime` extra for everything that creates a
session."""
