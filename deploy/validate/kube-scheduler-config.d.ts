// The fields of kube-scheduler's configuration file
// (kubescheduler.config.k8s.io/v1 KubeSchedulerConfiguration) that a
// scheduler with extenders sets, as TypeScript types: validate.mjs types
// deploy/'s scheduler configurations with them, so that the strict pass
// refuses a misspelt or misplaced field. Durations are Go duration strings
// ("5s"). Plugin sets are left open: kvbroker configures none.

export interface ILeaderElectionConfiguration {
  leaderElect?: boolean;
  leaseDuration?: string;
  renewDeadline?: string;
  retryPeriod?: string;
  resourceLock?: string;
  resourceName?: string;
  resourceNamespace?: string;
}

export interface IClientConnectionConfiguration {
  kubeconfig?: string;
  acceptContentTypes?: string;
  contentType?: string;
  qps?: number;
  burst?: number;
}

export interface IKubeSchedulerProfile {
  schedulerName?: string;
  percentageOfNodesToScore?: number;
  plugins?: Record<string, unknown>;
  pluginConfig?: { name: string; args?: Record<string, unknown> }[];
}

export interface IExtenderTLSConfig {
  insecure?: boolean;
  serverName?: string;
  certFile?: string;
  keyFile?: string;
  caFile?: string;
  certData?: string;
  keyData?: string;
  caData?: string;
}

export interface IExtender {
  urlPrefix: string;
  filterVerb?: string;
  preemptVerb?: string;
  prioritizeVerb?: string;
  weight?: number;
  bindVerb?: string;
  enableHTTPS?: boolean;
  tlsConfig?: IExtenderTLSConfig;
  httpTimeout?: string;
  nodeCacheCapable?: boolean;
  managedResources?: { name: string; ignoredByScheduler?: boolean }[];
  ignorable?: boolean;
}

export interface IKubeSchedulerConfiguration {
  apiVersion: "kubescheduler.config.k8s.io/v1";
  kind: "KubeSchedulerConfiguration";
  parallelism?: number;
  leaderElection?: ILeaderElectionConfiguration;
  clientConnection?: IClientConnectionConfiguration;
  enableProfiling?: boolean;
  enableContentionProfiling?: boolean;
  percentageOfNodesToScore?: number;
  podInitialBackoffSeconds?: number;
  podMaxBackoffSeconds?: number;
  profiles?: IKubeSchedulerProfile[];
  extenders?: IExtender[];
}
