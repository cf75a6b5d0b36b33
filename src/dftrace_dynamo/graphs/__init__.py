"""Graph tools: capture, hybrid tracing, FLOPs profile, explorer, drawing."""
