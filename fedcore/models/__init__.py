"""Model versions: artifacts, signing, the registry with its alias log, and two-phase publishing."""
