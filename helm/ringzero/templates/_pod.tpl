{{/*
The one pod spec every chart workload uses, so the "restricted" Pod Security Standard holds everywhere
by construction: each container gets the hardened security context (callers cannot override it) and a
writable /tmp, because root filesystems are read-only.

Call with (dict "root" $ "containers" YAML-LIST [ "volumes" YAML-LIST ] [ "restartPolicy" "Never" ]
[ "placement" true ]); placement adds the cluster's node selector and tolerations (job pods).
Containers list name, image, command/args, env, ports, probes, resources
and their own volumeMounts; securityContext is always replaced.
*/}}

{{- define "ringzero.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.runAsUser }}
runAsGroup: {{ .Values.runAsUser }}
fsGroup: {{ .Values.runAsUser }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "ringzero.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* A container that joins NCCL across pods: with cluster.ipcLock it gets IPC_LOCK back (InfiniBand). */}}
{{- define "ringzero.ncclContainerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: [ALL]
  {{- if .Values.cluster.ipcLock }}
  add: [IPC_LOCK]
  {{- end }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "ringzero.podSpec" -}}
{{- $root := .root -}}
{{- $hardened := fromYaml (include "ringzero.containerSecurityContext" $root) -}}
{{- $containers := list -}}
{{- range $c := fromYamlArray .containers -}}
{{- $mounts := append ($c.volumeMounts | default list) (dict "name" "tmp" "mountPath" "/tmp") -}}
{{- $containers = append $containers (merge (dict "securityContext" $hardened "volumeMounts" $mounts) $c) -}}
{{- end -}}
{{- $volumes := append (fromYamlArray (.volumes | default "[]")) (dict "name" "tmp" "emptyDir" dict) -}}
serviceAccountName: {{ include "ringzero.serviceAccountName" $root }}
{{- /* Chart pods never call the Kubernetes API; a KFP token is mounted explicitly where needed. */}}
automountServiceAccountToken: false
enableServiceLinks: false
restartPolicy: {{ .restartPolicy | default "Never" }}
securityContext:
  {{- include "ringzero.podSecurityContext" $root | nindent 2 }}
{{- if .placement }}
{{- with $root.Values.cluster.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $root.Values.cluster.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
{{- with $root.Values.images.pullSecrets }}
imagePullSecrets:
  {{- range . }}
  - name: {{ . }}
  {{- end }}
{{- end }}
containers:
  {{- toYaml $containers | nindent 2 }}
volumes:
  {{- toYaml $volumes | nindent 2 }}
{{- end -}}
