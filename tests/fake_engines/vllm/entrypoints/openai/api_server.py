"""`python -m vllm.entrypoints.openai.api_server`, stood in for (see tests/fake_engines/stand_in.py)."""

from stand_in import main

if __name__ == "__main__":
    main("vllm")
