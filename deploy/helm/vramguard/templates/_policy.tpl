{{- /*
The policy ConfigMap's two parts (src/vramguard/core/policy.py): the fields the quota admission policy reads too,
each in a key of its own named by its path, and the document (`policy.yaml`) with every other field. CEL cannot
read YAML, so the door and the agents read those fields from the same keys, and one edit of the ConfigMap changes
both (docs/rollout.md "Changing the policy").
*/}}

{{- /* The known sources' bytes per unit (core/quantity.py RESOURCE_UNIT_BYTES, ANNOTATION_UNIT_BYTES, ENV_UNIT_BYTES; core/sources.py PER_CONTAINER_ANNOTATION_UNIT_BYTES), as a dict */}}
{{- define "vramguard.policy.sourceUnits" -}}
{{ toJson (dict "resource:vramguard.io/vram" "1" "resource:aliyun.com/gpu-mem" "1073741824" "resource:nvidia.com/gpumem" "1048576" "resource:tencent.com/vcuda-memory" "268435456" "annotation:nvidia.com/container.<container>.gpu-memory" "1" "env:NVIDIA_GPU_MEMORY" "1048576" "annotation:vramguard.io/vram-limit" "1" "annotation:gpu-memory" "1048576") }}
{{- end -}}

{{- /* The door's keys, as a dict: `exempt_namespaces` and `quota_sources` (lists joined with ", "; set only when
the values set them), and `namespaces.<ns>.max_quota` of each namespace with a cap, as written. */}}
{{- define "vramguard.policy.keys" -}}
{{- $policy := .Values.policy | default dict }}
{{- $units := include "vramguard.policy.sourceUnits" . | fromJson }}
{{- $keys := dict }}
{{- if hasKey $policy "exempt_namespaces" }}
{{- $_ := set $keys "exempt_namespaces" (join ", " $policy.exempt_namespaces) }}
{{- end }}
{{- if hasKey $policy "quota_sources" }}
{{- range $source := $policy.quota_sources }}
{{- if not (or (hasPrefix "claim:" $source) (hasKey $units $source)) }}
{{- fail (printf "policy.quota_sources: vramguard knows the unit of no source %q" $source) }}
{{- end }}
{{- end }}
{{- $_ := set $keys "quota_sources" (join ", " $policy.quota_sources) }}
{{- end }}
{{- range $ns, $p := ($policy.namespaces | default dict) }}
{{- if and (kindIs "map" $p) (hasKey $p "max_quota") }}
{{- $text := $p.max_quota }}
{{- if not (kindIs "string" $text) }}{{ $text = toJson $text }}{{ end }}
{{- $_ := set $keys (printf "namespaces.%s.max_quota" $ns) $text }}
{{- end }}
{{- end }}
{{- toJson $keys }}
{{- end -}}

{{- /* The document: the policy less the door's fields (a namespace left with nothing else is left out). */}}
{{- define "vramguard.policy.document" -}}
{{- $all := .Values.policy | default dict }}
{{- $policy := omit $all "exempt_namespaces" "quota_sources" "namespaces" }}
{{- $namespaces := dict }}
{{- range $ns, $p := ($all.namespaces | default dict) }}
{{- if not (kindIs "map" $p) }}
{{- $_ := set $namespaces $ns $p }}
{{- else if omit $p "max_quota" }}
{{- $_ := set $namespaces $ns (omit $p "max_quota") }}
{{- end }}
{{- end }}
{{- if $namespaces }}{{ $_ := set $policy "namespaces" $namespaces }}{{ end }}
{{- toYaml $policy }}
{{- end -}}
