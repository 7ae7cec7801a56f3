"""Reading torch.profiler (Kineto) Chrome-trace JSON into a RunTable."""
