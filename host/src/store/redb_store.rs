//! TODO: redb backend (issue 3).
