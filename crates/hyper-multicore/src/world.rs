//! World
