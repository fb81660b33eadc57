//! Shared helpers for the npumem benches.
