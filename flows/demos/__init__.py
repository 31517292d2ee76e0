"""The demos `fedforest demo` runs: a generated federation on this machine, trained by the retrain flow."""
