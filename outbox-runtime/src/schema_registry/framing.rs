//! The wire format of records whose schema a registry names (placeholder, filled in next).
