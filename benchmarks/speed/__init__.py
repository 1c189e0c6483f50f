"""Speed probes: env throughput, training SPS, where an iteration's time goes, what compiling costs."""
