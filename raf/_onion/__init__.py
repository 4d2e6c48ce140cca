"""The onion: ContextProvider, the provider layer and compose; parallel groups; observer hooks."""
