//! Token counting strategies: free byte bound, local tokenizer and template, backend, estimate.
