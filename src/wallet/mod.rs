//! wallet
