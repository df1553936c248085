//! Reasoning normalization: field mapping both ways and inline think-tag splitting.
