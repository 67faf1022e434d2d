"""The library under `dirichlet-fl pilot`: a SuperLink and SuperNodes as real processes (processes,
federation), their TLS certificates (certificates), signed and pinned apps (app_signing, app_hub, staging),
the Fleet-only gateway (fleet_gateway, http_service) and the pilot's report (pilot_report)."""
