"""The graphcache HTTP service: a thin skin over the library's stores."""
