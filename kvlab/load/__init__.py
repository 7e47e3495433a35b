"""What compression buys under load: a config's server measured with the task's prompts at closed-loop concurrency
levels and open-loop rates (:mod:`.client`), by ``vllm bench serve``'s definitions (:mod:`.metrics`), beside what
the server says of its queue and pool (:mod:`kvlab.engines.load_monitor`)."""
