"""Code shared by the API and the workers; imports neither Flask nor torch."""
