"""Host-side media preprocessing for the Omni graphs (numpy): what the processors compute
before pixel values or log-mel features enter a graph."""
