{{/*
Object names are fixed, not derived from the release name: the agent's code names the status ConfigMaps, and one
installation per cluster is all that makes sense (two agents on one node would edit the same manifest).
*/}}
{{- define "sp.name" -}}scheduler-patcher{{- end -}}

{{/* The labels of manifests/ plus helm's own: the drift test strips exactly helm.sh/chart, managed-by, instance, version. */}}
{{- define "sp.labels" -}}
app.kubernetes.io/name: scheduler-patcher
app.kubernetes.io/part-of: scheduler-patcher
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{- define "sp.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/* The platform's manifest folder and control-plane label value. */}}
{{- define "sp.platformManifestDir" -}}
{{- if eq .Values.platform "rke2" -}}/var/lib/rancher/rke2/agent/pod-manifests{{- else -}}/etc/kubernetes/manifests{{- end -}}
{{- end -}}

{{- define "sp.manifestDir" -}}
{{- .Values.hostPaths.manifestDir | default (include "sp.platformManifestDir" .) -}}
{{- end -}}

{{- define "sp.nodeSelector" -}}
{{- if .Values.nodeSelector -}}
{{ toYaml .Values.nodeSelector }}
{{- else -}}
kubernetes.io/os: linux
node-role.kubernetes.io/control-plane: {{ if eq .Values.platform "rke2" }}"true"{{ else }}""{{ end }}
{{- end -}}
{{- end -}}

{{- define "sp.controlPlaneTolerations" -}}
- key: node-role.kubernetes.io/control-plane
  operator: Exists
  effect: NoSchedule
- key: node-role.kubernetes.io/master
  operator: Exists
  effect: NoSchedule
{{- if eq .Values.platform "rke2" }}
- key: CriticalAddonsOnly
  operator: Exists
{{- end }}
{{- end -}}

{{- define "sp.tolerations" -}}
{{- if .Values.tolerations -}}
{{ toYaml .Values.tolerations }}
{{- else -}}
{{ include "sp.controlPlaneTolerations" . }}
{{- end -}}
{{- end -}}

{{/* The node paths the agent and the restore Job share (a different --state-dir would not find the agent's record). */}}
{{- define "sp.pathEnv" -}}
- name: PATCHER_HOST_ROOT
  value: /host
- name: PATCHER_MANIFEST_DIR
  value: {{ include "sp.manifestDir" . | quote }}
- name: PATCHER_MANIFEST_NAME
  value: {{ .Values.hostPaths.manifestName | quote }}
- name: PATCHER_HOST_CONFIG_DIR
  value: {{ .Values.hostPaths.configDir | quote }}
- name: PATCHER_STATE_DIR
  value: {{ .Values.hostPaths.stateDir | quote }}
{{- end -}}

{{/* Folders, not files: the manifest is replaced by rename, which a file bind mount would not follow. */}}
{{- define "sp.hostMounts" -}}
- name: manifests
  mountPath: {{ printf "/host%s" (include "sp.manifestDir" .) | quote }}
- name: host-config
  mountPath: {{ printf "/host%s" .Values.hostPaths.configDir | quote }}
- name: state
  mountPath: {{ printf "/host%s" .Values.hostPaths.stateDir | quote }}
{{- end -}}

{{/* The agent's read-only mounts of node folders that hold a foreign --config (hostPaths.foreignConfigDirs): the
     agent merges it; the restore Job never reads it. */}}
{{- define "sp.foreignMounts" -}}
{{- range $i, $dir := .Values.hostPaths.foreignConfigDirs }}
- name: {{ printf "foreign-config-%d" $i }}
  mountPath: {{ printf "/host%s" $dir | quote }}
  readOnly: true
{{- end }}
{{- end -}}

{{- define "sp.foreignVolumes" -}}
{{- range $i, $dir := .Values.hostPaths.foreignConfigDirs }}
# A folder holding a --config the agent did not write (merged into ours): read only, and it must exist.
- name: {{ printf "foreign-config-%d" $i }}
  hostPath:
    path: {{ $dir | quote }}
    type: Directory
{{- end }}
{{- end -}}

{{- define "sp.hostVolumes" -}}
# The kubelet's static-pod folder: it must exist (Directory), the agent never creates it.
- name: manifests
  hostPath:
    path: {{ include "sp.manifestDir" . | quote }}
    type: Directory
- name: host-config
  hostPath:
    path: {{ .Values.hostPaths.configDir | quote }}
    type: DirectoryOrCreate
- name: state
  hostPath:
    path: {{ .Values.hostPaths.stateDir | quote }}
    type: DirectoryOrCreate
{{- end -}}

{{/* The container security context of every pod here: not privileged, no escalation, read-only image, no capability. */}}
{{- define "sp.containerSecurity" -}}
privileged: false
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
{{- end -}}

{{/* uid/gid 0: the kubelet's manifest folder and the manifest are root-owned (0700/0600); every capability is dropped. */}}
{{- define "sp.rootPodSecurity" -}}
runAsUser: 0
runAsGroup: 0
runAsNonRoot: false
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "sp.gatekeeperLabels" -}}
{{ include "sp.labels" . }}
app.kubernetes.io/component: gatekeeper
{{- end -}}
