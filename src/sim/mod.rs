//! Backend simulator: a real HTTP server speaking the llama.cpp, vLLM and SGLang dialects.
