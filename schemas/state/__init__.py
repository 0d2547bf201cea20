"""KV record types: what each service keeps in its bucket. Readers (`nodeward status`, the CLI) use these types, never a copy of the layout."""
