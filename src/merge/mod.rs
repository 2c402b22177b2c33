//! merge
