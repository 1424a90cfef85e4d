{{/* Names, labels, images and S3 settings shared by every template. */}}

{{- define "ringzero.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{/* Object-name prefix; 40 characters leave room for suffixes such as "-pipeline-upload". */}}
{{- define "ringzero.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "ringzero.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "ringzero.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Selector labels of one component. Call with (dict "root" $ "component" "minio"). */}}
{{- define "ringzero.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ringzero.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* All labels of one component. Call with (dict "root" $ "component" "minio"). */}}
{{- define "ringzero.labels" -}}
{{ include "ringzero.selectorLabels" . }}
app.kubernetes.io/part-of: ringzero
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ include "ringzero.chart" .root }}
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "ringzero.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "ringzero.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name: give the existing service account to use when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* repository@digest when the image value sets digest (its tag is then ignored), repository@sha256:...
for a digest given as the tag, else repository:tag. Call with an image value. */}}
{{- define "ringzero.image" -}}
{{- if .digest -}}
{{- printf "%s@%s" .repository .digest -}}
{{- else if hasPrefix "sha256:" .tag -}}
{{- printf "%s@%s" .repository .tag -}}
{{- else -}}
{{- printf "%s:%s" .repository .tag -}}
{{- end -}}
{{- end -}}

{{- define "ringzero.minioName" -}}
{{- printf "%s-minio" (include "ringzero.fullname" .) -}}
{{- end -}}

{{/* host:port of the S3 API the runs use: the bundled MinIO's Service, or s3.endpoint. */}}
{{- define "ringzero.s3Endpoint" -}}
{{- if .Values.minio.enabled -}}
{{- printf "%s.%s.svc:9000" (include "ringzero.minioName" .) .Release.Namespace -}}
{{- else -}}
{{- .Values.s3.endpoint -}}
{{- end -}}
{{- end -}}

{{- define "ringzero.s3Secure" -}}
{{- if .Values.minio.enabled }}false{{ else }}{{ .Values.s3.secure }}{{ end -}}
{{- end -}}

{{- define "ringzero.s3Root" -}}
{{- printf "s3://%s/%s" .Values.s3.bucket .Values.s3.prefix -}}
{{- end -}}

{{/* Folder the S3 Secret is mounted at; its two keys appear as the files access-key and secret-key. */}}
{{- define "ringzero.s3CredentialDir" -}}/etc/ringzero/s3{{- end -}}

{{/* The S3 keys as paths of mounted files: values never reach the pod spec or the environment. */}}
{{- define "ringzero.s3CredentialEnv" -}}
- name: RINGZERO_S3_ACCESS_KEY_FILE
  value: {{ include "ringzero.s3CredentialDir" . }}/access-key
- name: RINGZERO_S3_SECRET_KEY_FILE
  value: {{ include "ringzero.s3CredentialDir" . }}/secret-key
{{- end -}}

{{/* The S3 Secret as a read-only volume holding only its two keys, readable by the pod's group (fsGroup). */}}
{{- define "ringzero.s3CredentialVolume" -}}
- name: s3-credentials
  secret:
    secretName: {{ .Values.s3.existingSecret }}
    defaultMode: 0440
    items:
      - {key: {{ .Values.s3.accessKeyKey }}, path: access-key}
      - {key: {{ .Values.s3.secretKeyKey }}, path: secret-key}
{{- end -}}

{{- define "ringzero.s3CredentialMount" -}}
- {name: s3-credentials, mountPath: {{ include "ringzero.s3CredentialDir" . }}, readOnly: true}
{{- end -}}

{{/* Cross-field rules the schema cannot state clearly; each failure names the fields to change. */}}
{{- define "ringzero.validate" -}}
{{- range $name, $image := dict "images.trainer" .Values.images.trainer "images.rollout" .Values.images.rollout "images.cpu" .Values.images.cpu "minio.image" .Values.minio.image "minio.clientImage" .Values.minio.clientImage -}}
{{- if and (eq $image.tag "latest") (not $image.digest) -}}
{{- fail (printf "%s.tag: 'latest' is not a pinned tag; give a release tag or a sha256 digest" $name) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.minio.enabled .Values.s3.endpoint -}}
{{- fail "s3.endpoint is set and minio.enabled is true: use the bundled MinIO (leave s3.endpoint empty) or an external store (set minio.enabled=false), not both" -}}
{{- end -}}
{{- if and (not .Values.minio.enabled) (not .Values.s3.endpoint) -}}
{{- fail "s3.endpoint is empty and minio.enabled is false: set s3.endpoint to your S3 API (host:port) or enable the bundled MinIO" -}}
{{- end -}}
{{- if and (eq .Values.cluster.device "cpu") (gt (int .Values.cluster.gpusPerNode) 0) -}}
{{- fail "cluster.gpusPerNode must be 0 when cluster.device is cpu" -}}
{{- end -}}
{{- if and (eq .Values.cluster.device "gpu") (eq (int .Values.cluster.gpusPerNode) 0) -}}
{{- fail "cluster.gpusPerNode must be at least 1 when cluster.device is gpu (use cluster.device=cpu for CPU-only clusters)" -}}
{{- end -}}
{{- if and (eq .Values.cluster.rollout.weightSync "disk") (not .Values.cluster.rollout.sharedWeightsPvc) -}}
{{- fail "cluster.rollout.weightSync disk needs cluster.rollout.sharedWeightsPvc: SGLang loads pushed weights from a local path, so trainer and server pods must mount one ReadWriteMany claim; set it or use weightSync distributed" -}}
{{- end -}}
{{- if .Values.pipeline.upload -}}
{{- $shipped := keys .Values.runConfigs.extra -}}
{{- if .Values.runConfigs.bundled -}}
{{- range $path, $_ := .Files.Glob "files/runs/*.yaml" -}}
{{- $shipped = append $shipped (base $path) -}}
{{- end -}}
{{- end -}}
{{- if not (has .Values.pipeline.runConfig $shipped) -}}
{{- fail (printf "pipeline.runConfig %q is not among the shipped run configs %v: add it to runConfigs.extra or pick one of them" .Values.pipeline.runConfig (sortAlpha $shipped)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
