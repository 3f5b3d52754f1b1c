//! TODO: etcd backend (issue 9).
