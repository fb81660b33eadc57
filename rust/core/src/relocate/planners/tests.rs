//! Unit tests of the planners on hand-built censuses and models.
