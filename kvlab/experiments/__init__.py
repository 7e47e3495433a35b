"""Running experiments: submit, evaluate (runner, worker), store results, analyse and report them."""
