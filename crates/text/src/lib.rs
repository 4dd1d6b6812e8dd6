//! Placeholder: filled by the text layer.
