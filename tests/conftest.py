"""Suite-wide settings: tests run against the real PostgreSQL on this machine unless DATABASE_URL
says otherwise (the README's test command sets it)."""
