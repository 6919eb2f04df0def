//! CPU interpreter.
