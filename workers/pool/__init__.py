"""The model pool: every loaded model lives in its own spawned subprocess."""
